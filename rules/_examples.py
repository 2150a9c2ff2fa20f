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


# A final test pass after training: the test loader is read once, outside any loop, so workers
# and pinned memory would start up for a single pass.
TEST_PASS_AFTER_TRAINING = """
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets, transforms
            train_loader = DataLoader(datasets.CIFAR10("data", train=True, transform=transforms.ToTensor()),
                                      batch_size=128, num_workers=4, pin_memory=True, persistent_workers=True)
            test_loader = DataLoader(datasets.CIFAR10("data", train=False, transform=transforms.ToTensor()), batch_size=512)
            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(30):
                for images, labels in train_loader:
                    loss = criterion(model(images.cuda()), labels.cuda())
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            model.eval()
            correct = 0
            with torch.no_grad():
                for images, labels in test_loader:
                    correct += (model(images.cuda()).argmax(1) == labels.cuda()).sum().item()
"""
