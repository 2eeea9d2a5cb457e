"""Record the gradients of your own PyTorch training loop (README: "Use it in your own loop").

A small MLP on scikit-learn's 8x8 digits, trained with plain SGD; every step's gradient
of the two weight matrices goes into runs/own-loop/gradients.zarr.

    python examples/plain_loop.py && gradspec info runs/own-loop/gradients.zarr
"""

import torch
from sklearn.datasets import load_digits
from torch import nn

from gradspec import GradientRecorder

torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)

with GradientRecorder(out="runs/own-loop", model=model, params="*.weight", overwrite=True) as recorder:
    for _epoch in range(3):
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            recorder.record_step(loss=loss.item(), batch_size=len(xb))
            optimizer.step()
print(f"recorded {recorder.rows_recorded} steps into runs/own-loop/gradients.zarr")
