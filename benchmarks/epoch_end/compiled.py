"""eager.py --compile: the same training with torch.compile and without the pause."""
import runpy
import sys
from pathlib import Path

sys.argv.append("--compile")
runpy.run_path(str(Path(__file__).with_name("eager.py")), run_name="__main__")
