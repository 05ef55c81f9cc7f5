"""The `.om` file: the container (header, partition table, partitions), the MODEL_DEF encoding and
the KERNELS partition's records. See docs/format.md."""

from .container import HEADER, MAGIC, PAGE, VERSION, Entry, OmFile, Part, write

__all__ = ["Entry", "HEADER", "MAGIC", "OmFile", "PAGE", "Part", "VERSION", "write"]
