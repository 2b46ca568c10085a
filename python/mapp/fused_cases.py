"""The mapp.fused ops of MLIR text (docs/fusion.md) as the case lines that
mapp-fused-codegen-check and mapp-cuda-kernel-test (MAPP_FUSED_CASES) read:
`program<TAB>domain<TAB>outputs<TAB>shape;shape...` (dims joined by x, `-`
for a scalar operand). Used by test/python/test_fused_codegen.py and
bench/gpu/fuse_gen.sh.

    python3 -m mapp.fused_cases FILE.mlir... -o cases.tsv
"""

import argparse
import re

FUSED_RE = re.compile(r'mapp\.fused [^{]*\{([^}]*)\} : \(([^)]*)\) ->')


def shape_of(tensor_type):
    """'tensor<2x4x8xf32>' -> '2x4x8'; a scalar tensor -> '-'."""
    dims = tensor_type.strip()[len("tensor<"):-1].split("x")[:-1]
    return "x".join(dims) or "-"


def fused_cases(mlir_text):
    """One case line per mapp.fused op of the text, in order."""
    cases = []
    for attrs, operands in FUSED_RE.findall(mlir_text):
        domain = re.search(r"domain = array<i64(?:: ([^>]*))?>", attrs).group(1) or ""
        outputs = re.search(r"outputs = array<i64: ([^>]*)>", attrs).group(1)
        program = re.search(r'program = "([^"]*)"', attrs).group(1)
        shapes = [shape_of(t) for t in re.findall(r"tensor<[^>]*>", operands)]
        cases.append("\t".join([program, domain.replace(" ", ""), outputs.replace(" ", ""),
                                ";".join(shapes)]))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mlir", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    cases = []
    for path in args.mlir:
        with open(path) as f:
            cases += fused_cases(f.read())
    with open(args.output, "w") as f:
        f.write("".join(c + "\n" for c in sorted(set(cases))))
    print(f"{len(set(cases))} distinct fused cases")


if __name__ == "__main__":
    main()
