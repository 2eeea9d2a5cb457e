"""Record the gradients of a Hugging Face ``Trainer`` run (README: "Use it in your own training loop").

A small BERT (2 layers, hidden size 64, randomly initialised from a ``BertConfig``: no
download) fine-tuned non-privately on synthetic token sequences whose label is the
parity of the first token; every step's gradient of the attention query/key/value weights
goes into runs/hf/gradients.zarr. ``max_grad_norm=0.0`` turns the Trainer's own clipping off,
so the rows are the gradients the optimizer receives.

    python examples/hf_trainer.py && gradspec info runs/hf/gradients.zarr
"""

import logging

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from gradspec.collect import GradientRecorderCallback

logging.getLogger("transformers").setLevel(logging.ERROR)
torch.manual_seed(0)
n, length = 512, 16
ids = torch.randint(1, 8, (n, length))
labels = ids[:, 0] % 2


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return n

    def __getitem__(self, i):
        return {"input_ids": ids[i], "attention_mask": torch.ones(length, dtype=torch.long), "labels": labels[i]}


model = BertForSequenceClassification(BertConfig(
    vocab_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
    max_position_embeddings=length, num_labels=2))
args = TrainingArguments(output_dir="runs/hf/trainer", per_device_train_batch_size=32, num_train_epochs=3,
                         learning_rate=1e-3, max_grad_norm=0.0, report_to=[], use_cpu=True, save_strategy="no",
                         logging_strategy="no", disable_tqdm=True, seed=0)
callback = GradientRecorderCallback(out="runs/hf", params="*attention.self.*.weight", overwrite=True)
trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[callback])
result = trainer.train()
print(f"recorded {trainer.state.global_step} steps into runs/hf/gradients.zarr "
      f"(train loss {result.training_loss:.4f})")
