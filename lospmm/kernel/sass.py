"""A cubin's SASS, read with nvdisasm: opcode counts per function. For the benchmarks' instruction
statistics (per kernel design: instructions per useful multiply-add, code bytes per tile); nvdisasm
comes with the `bench` extra (nvidia-cuda-nvdisasm) or a CUDA toolkit on PATH."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path


class NvdisasmMissing(RuntimeError):
    """No nvdisasm on PATH or in the pip wheel."""


def nvdisasm() -> str:
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # pip nvidia-cuda-nvdisasm installs nvidia/cu13/bin/nvdisasm
    except ImportError:
        raise NvdisasmMissing("nvdisasm not found: pip install nvidia-cuda-nvdisasm (the bench extra)") from None
    for base in nvidia.__path__:
        for p in Path(base).glob("*/bin/nvdisasm"):
            return str(p)
    raise NvdisasmMissing("nvdisasm not found: pip install nvidia-cuda-nvdisasm (the bench extra)")


OPCODE = r"^\s+(?:/\*[0-9a-f]+\*/\s+)?(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)"
# a tile function's own work: multiply-adds, loads and stores, spills, address arithmetic, padding
BODY = {"FFMA", "FMUL", "HFMA2", "LDG", "STG", "LDL", "STL", "IMAD", "IADD3", "LEA", "NOP", "BRA"}
BYTES_PER_INSTRUCTION = 16  # sm_70 and later


def opcodes_by_function(cubin: bytes) -> dict[str, list[str]]:
    """Each function's opcodes, in order (without their modifiers)."""
    sass = disassembled(cubin)
    by_function = {}
    for chunk in re.split(r"^\s*\.section\s+\.text\.", sass, flags=re.M)[1:]:
        name = chunk.split(",", 1)[0].strip()
        by_function[name] = [o.split(".")[0] for o in re.findall(OPCODE, chunk, flags=re.M)]
    return by_function


def function_sizes(cubin: bytes) -> dict[str, int]:
    """Instructions per function of a cubin."""
    return {name: len(ops) for name, ops in opcodes_by_function(cubin).items()}


def sass_counts(cubin: bytes, entry: str) -> dict[str, int]:
    """FFMA (and FMUL), HFMA2 (a half kernel's packed multiply-adds), LDG, STG, spill loads and stores, all instructions, the entry's, and the
    tile functions' instructions that are not part of their own work (BODY): call overhead."""
    by_function = opcodes_by_function(cubin)
    base = [o for ops in by_function.values() for o in ops]
    tile_other = sum(1 for name, ops in by_function.items() if name != entry for o in ops if o not in BODY)
    return {"FFMA": base.count("FFMA") + base.count("FMUL"), "HFMA2": base.count("HFMA2"),
            "LDG": base.count("LDG"), "STG": base.count("STG"),
            "LDL": base.count("LDL"), "STL": base.count("STL"), "total": len(base),
            "entry": len(by_function.get(entry, [])), "tile_other": tile_other}


LABEL = re.compile(r"^\s*(\.L_x_\d+):")
INSTRUCTION = re.compile(OPCODE + r"([^;]*)")  # an opcode with its operands
FMA_PIPE = ("FFMA", "HFMA2", "HMMA")  # a multiply-add of fp32, of a packed half pair, or of the tensor cores


def fma_loop(sass: str) -> list[str]:
    """The opcodes (without modifiers) of the longest loop of `sass` (one function's nvdisasm text) that
    holds multiply-adds: from a label to the branch back to it. A kernel whose loop body is straight code
    (the N:M kernels' chunk loop on one path) executes exactly these once an iteration. [] when none."""
    ops, labels, best = [], {}, []
    for line in sass.splitlines():
        label = LABEL.match(line)
        if label:
            labels[label.group(1)] = len(ops)
            continue
        found = INSTRUCTION.match(line)
        if not found:
            continue
        op, operands = found.group(1).split(".")[0], found.group(2)
        ops.append(op)
        target = re.search(r"\((\.L_x_\d+)\)", operands) if op == "BRA" else None
        if target and labels.get(target.group(1), len(ops)) < len(ops) - 1:
            body = ops[labels[target.group(1)]:]
            if any(o in FMA_PIPE for o in body) and len(body) > len(best):
                best = body
    return list(best)


def disassembled(cubin: bytes) -> str:
    """nvdisasm's text of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
