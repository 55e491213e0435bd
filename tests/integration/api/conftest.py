import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "unit" / "boot"))  # bootdata
sys.path.insert(0, str(HERE.parent / "boot"))  # servers
sys.path.insert(0, str(HERE))  # loopback_node
