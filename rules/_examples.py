"""Rule examples that several rules share: one real pattern, checked by each rule that must
stay quiet on it."""

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


# A validation loader read every epoch by an evaluation function that takes no optimizer step:
# its copies and worker restarts hold up no training step, so neither pinning nor persistent
# workers is advised for it (the training loader has both).
VALIDATION_EVERY_EPOCH = """
            import torch
            from torch.utils.data import DataLoader

            def evaluate(net, batches):
                net.eval()
                hits = 0
                with torch.no_grad():
                    for frames, targets in batches:
                        hits += (net(frames.cuda()).argmax(1) == targets.cuda()).sum()
                net.train()
                return hits

            fit_loader = DataLoader(fit_set, batch_size=64, shuffle=True, num_workers=6, pin_memory=True,
                                    persistent_workers=True)
            holdout_loader = DataLoader(holdout_set, batch_size=256, num_workers=6)
            net = Classifier().cuda()
            opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
            for epoch in range(40):
                for frames, targets in fit_loader:
                    loss = torch.nn.functional.cross_entropy(net(frames.cuda()), targets.cuda())
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                print(epoch, float(evaluate(net, holdout_loader)))
"""

# A DQN on Atari frames (cleanrl's): the Nature CNN learns between the emulator's steps, on batches
# of 32. The run waits on the environment, not on the GPU: neither mixed precision (SF202) nor
# TF32 (SF201) is worth advising, whatever the network's layers.
DQN_BETWEEN_ENV_STEPS = """
            import gymnasium as gym
            import torch
            import torch.nn as nn

            q_network = nn.Sequential(
                nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 6),
            ).cuda()
            optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-4, fused=True)
            envs = gym.vector.SyncVectorEnv([make_env()])
            obs, _ = envs.reset()
            for global_step in range(10_000_000):
                actions = pick(q_network, obs)
                obs, rewards, terminations, truncations, infos = envs.step(actions)
                buffer.add(obs, actions, rewards)
                if global_step > 80_000 and global_step % 4 == 0:
                    data = buffer.sample(32)
                    loss = td_loss(q_network, data)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """

# An RL agent's actor (TD3): an MLP at most 256 wide, too narrow for tensor cores to matter, so
# neither mixed precision (SF202) nor TF32 (SF201) is worth advising.
# The UvA tutorial's classifier: its widths are the arguments it is built with.
TOY_MLP = """
            import torch
            import torch.nn as nn

            class SimpleClassifier(nn.Module):
                def __init__(self, num_inputs, num_hidden, num_outputs):
                    super().__init__()
                    self.linear1 = nn.Linear(num_inputs, num_hidden)
                    self.act_fn = nn.Tanh()
                    self.linear2 = nn.Linear(num_hidden, num_outputs)

                def forward(self, x):
                    return self.linear2(self.act_fn(self.linear1(x)))

            model = SimpleClassifier(num_inputs=2, num_hidden=4, num_outputs=1).cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                loss = nn.functional.binary_cross_entropy_with_logits(model(x.cuda()).squeeze(1), y.cuda())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            """
NARROW_MLP = """
            import torch
            import torch.nn as nn
            import torch.nn.functional as F

            class Actor(nn.Module):
                def __init__(self, state_dim, action_dim):
                    super().__init__()
                    self.l1 = nn.Linear(state_dim, 256)
                    self.l2 = nn.Linear(256, 256)
                    self.l3 = nn.Linear(256, action_dim)

                def forward(self, state):
                    return torch.tanh(self.l3(F.relu(self.l2(F.relu(self.l1(state))))))

            actor = Actor(17, 6).cuda()
            optimizer = torch.optim.Adam(actor.parameters(), lr=3e-4, fused=True)
            for state in batches:
                loss = -actor(state.cuda(non_blocking=True)).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """
