"""The project model: files of one scan that import each other, analysed together.

Real training code is split: ``main.py`` builds the loaders, the model and the optimizer,
``engine.py`` holds the loop, ``models.py`` the network and ``config.py`` says ``DEVICE =
"cuda"``. Each file is still analysed on its own (one libcst parse, all rules in one walk), but
first a cheap pass reads every file with Python's own ``ast`` parser and keeps its *facts*
(``facts.py``: what it imports, which of its functions hold a training loop or take one step,
which parameters that loop iterates, which names hold a CUDA device, what it calls on every
step). ``linker.py`` then resolves the imports between the scanned files and gives each file its
``Links``: the facts of the modules it imports and what its importers tell it (they train on
CUDA; they call one of its functions on every step). ``FileContext`` reads those, so a
``DataLoader`` built in ``main.py`` and iterated in ``engine.py`` is reported in ``main.py``,
where its fix belongs.
"""

from speedfix.project.facts import FunctionFacts, ModuleFacts, extract_facts
from speedfix.project.linker import Links, is_test_file, link

__all__ = ["FunctionFacts", "Links", "ModuleFacts", "extract_facts", "is_test_file", "link"]
