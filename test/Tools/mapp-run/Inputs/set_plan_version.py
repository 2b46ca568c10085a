"""Rewrites the `version` field of a plan (root table field 0, a uint32) in
place: python3 set_plan_version.py PLAN VERSION. Minimal FlatBuffers walk:
root uoffset at byte 0, the table's soffset to its vtable, the field's
offset in the vtable at byte 4."""
import struct
import sys

path, version = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    buf = bytearray(f.read())
table = struct.unpack_from("<I", buf, 0)[0]
vtable = table - struct.unpack_from("<i", buf, table)[0]
field = struct.unpack_from("<H", buf, vtable + 4)[0]
if field == 0:
    sys.exit("version field is absent (default 0)")
struct.pack_into("<I", buf, table + field, version)
with open(path, "wb") as f:
    f.write(buf)
