"""Rule examples that several DataLoader rules share: one real pattern, checked by each rule
that must stay quiet on it."""

# A notebook: batch-1 loaders shown in a cell and peeked at with `next(iter(...))`; a later
# training function's parameter has the same name as one of them, and is given another loader.
NOTEBOOK_PEEKED_LOADERS = """
            import torch
            from torch.utils.data import DataLoader
            train_dataloader = DataLoader(train_data, batch_size=1, num_workers=1)
            test_dataloader = DataLoader(test_data, batch_size=1, num_workers=1)
            train_dataloader, test_dataloader
            img, label = next(iter(train_dataloader))

            def train(model, train_dataloader, optimizer, epochs):
                for epoch in range(epochs):
                    for x, y in train_dataloader:
                        loss = model(x.cuda()).sum()
                        loss.backward()
                        optimizer.step()

            train(model, train_dataloader=real_loader, optimizer=opt, epochs=5)
"""
