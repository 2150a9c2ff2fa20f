"""A small CPU training script with three slow habits (`apply --verify` timing example)."""
import gc

import torch

torch.autograd.set_detect_anomaly(True)  # SF603: debugging aid left on
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(512, 256), torch.randint(0, 10, (512,))
for epoch in range(40):
    for step in range(100):
        opt.zero_grad(set_to_none=False)  # SF402
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        gc.collect()  # SF304: a full collection every step
    print(f"epoch {epoch} loss {loss.item():.4f}")
