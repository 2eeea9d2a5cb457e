"""Record the gradients of an Opacus DP-SGD loop (README: "Use it in your own training loop").

The MLP of examples/plain_loop.py on scikit-learn's 8x8 digits, made private by Opacus's
``PrivacyEngine.make_private`` (Poisson sampling, noise multiplier 1.0, C = 1.0); every
real step's mean clipped gradient before noise, over the step's examples, goes into
runs/opacus/gradients.zarr, with Opacus's accountant and its epsilon at delta = 1e-5.

    python examples/opacus_loop.py && gradspec info runs/opacus/gradients.zarr
"""

import warnings

import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from torch import nn

from gradspec import GradientRecorder

warnings.filterwarnings("ignore", module="opacus")  # its notes on secure RNG and the optimizer
warnings.filterwarnings("ignore", message="Full backward hook")  # torch, on the first layer's hook
torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
model, optimizer, loader = PrivacyEngine().make_private(
    module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0)

with GradientRecorder(out="runs/opacus", model=model, params="*.weight", overwrite=True) as recorder:
    recorder.attach_opacus(optimizer, delta=1e-5)
    for epoch in range(3):
        recorder.epoch = epoch
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            recorder.observe_loss(loss)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
config = recorder.store.config
print(f"recorded {recorder.rows_recorded} steps into runs/opacus/gradients.zarr; "
      f"Opacus's {config['opacus']['accountant']} accountant: epsilon = {config['final_epsilon']:.3f} "
      f"at delta = 1e-05")
