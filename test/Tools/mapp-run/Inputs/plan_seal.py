"""The .mplan seal (runtime/schema/plan.fbs PlanSeal): a 24-byte trailer
{magic "MPSL", version u32, body_bytes u64, checksum u32, reserved u32} after
the FlatBuffers body; checksum = CRC-32 of body + the first 16 trailer bytes.

  python3 plan_seal.py seal BODY OUT         seal a FlatBuffers body (flatc -b)
  python3 plan_seal.py set-version PLAN V    rewrite Plan.version and the
                                             seal's version, then re-seal
  python3 plan_seal.py reseal PLAN           recompute the seal of a plan
                                             whose body was edited in place
"""
import struct
import sys
import zlib

SEAL = 24
MAGIC = 0x4C53504D  # "MPSL"
VERSION = 2  # plan.fbs SchemaVersion.Current


def seal(body, version=VERSION):
    head = struct.pack("<IIQ", MAGIC, version, len(body))
    crc = zlib.crc32(head, zlib.crc32(body)) & 0xFFFFFFFF
    return bytes(body) + head + struct.pack("<II", crc, 0)


def body_of(buf):
    """The body of a sealed plan; a file without a seal is all body."""
    if len(buf) >= SEAL and struct.unpack_from("<I", buf, len(buf) - SEAL)[0] == MAGIC:
        return bytearray(buf[:-SEAL])
    return bytearray(buf)


def set_body_version(body, version):
    # Root uoffset at byte 0, soffset to the vtable, field 0 at vtable + 4.
    table = struct.unpack_from("<I", body, 0)[0]
    vtable = table - struct.unpack_from("<i", body, table)[0]
    field = struct.unpack_from("<H", body, vtable + 4)[0]
    if field == 0:
        sys.exit("version field is absent (default 0)")
    struct.pack_into("<I", body, table + field, version)


def main(argv):
    cmd = argv[1]
    if cmd == "seal":
        data = open(argv[2], "rb").read()
        open(argv[3], "wb").write(seal(data))
    elif cmd == "set-version":
        body = body_of(open(argv[2], "rb").read())
        set_body_version(body, int(argv[3]))
        open(argv[2], "wb").write(seal(body, int(argv[3])))
    elif cmd == "reseal":
        body = body_of(open(argv[2], "rb").read())
        open(argv[2], "wb").write(seal(body))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
