//===- MappCpOps.cpp - verifiers, costs and gradients of the cp ops -------===//
//
// Context parallelism (MappCpOps.td, docs/context-parallel.md). The shape
// rules here are the compile-time half of KernelSpecs.cpp's cp_* checks.
//
//===----------------------------------------------------------------------===//
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mapp;

static ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}

/// cp_shard: `whole` → `share`; cp_unshard: `share` → `whole`. Alike but
/// for `dim`, where whole = members · share and the sequence splits into
/// 2·members equal chunks.
static LogicalResult verifyCpLayout(Operation *op, Value whole, Value share,
                                    int64_t dim, int64_t members) {
  if (members < 1)
    return op->emitOpError("members must be >= 1, got ") << members;
  ArrayRef<int64_t> w = shapeOf(whole), s = shapeOf(share);
  if (dim < 0 || dim >= (int64_t)w.size())
    return op->emitOpError("dim ") << dim << " is outside rank " << w.size();
  if (cast<RankedTensorType>(whole.getType()).getElementType() !=
      cast<RankedTensorType>(share.getType()).getElementType())
    return op->emitOpError("operand and result element types differ");
  if (w[dim] % (2 * members) != 0)
    return op->emitOpError("sequence length ")
           << w[dim] << " along dim " << dim << " is not divisible by 2·cp = "
           << 2 * members << " (load-balanced causal chunks)";
  SmallVector<int64_t> want(w);
  want[dim] = w[dim] / members;
  if (s != ArrayRef<int64_t>(want))
    return op->emitOpError("the share must have ")
           << want[dim] << " along dim " << dim << " and the rest alike";
  return success();
}

LogicalResult CpShardOp::verify() {
  return verifyCpLayout(*this, getX(), getResult(), getDim(), getMembers());
}
LogicalResult CpUnshardOp::verify() {
  return verifyCpLayout(*this, getResult(), getX(), getDim(), getMembers());
}
uint64_t CpShardOp::getFlops() { return 0; }
uint64_t CpUnshardOp::getFlops() { return 0; }

LogicalResult CpShardOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                       SmallVectorImpl<Value> &grads) {
  if (!dys[0] || !isa<FloatType>(getResult().getType().getElementType())) {
    grads.push_back(Value());
    return success();
  }
  grads.push_back(b.create<CpUnshardOp>(getLoc(), getX().getType(), dys[0],
                                        getDimAttr(), getMembersAttr(),
                                        getGroupAttr()));
  return success();
}

LogicalResult CpUnshardOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<CpShardOp>(getLoc(), getX().getType(), dys[0],
                                      getDimAttr(), getMembersAttr(),
                                      getGroupAttr()));
  return success();
}

LogicalResult CpAttentionOp::verify() {
  ArrayRef<int64_t> q = shapeOf(getQ()), k = shapeOf(getK());
  if (q.size() != 3)
    return emitOpError("q must be [batch, seq share, hidden], got rank ")
           << q.size();
  if (k.size() != 3 || k[0] != q[0] || k[1] != q[1] || shapeOf(getV()) != k ||
      getResult().getType() != getQ().getType())
    return emitOpError("k and v must be one shape [batch, seq share, "
                       "kv_hidden] and the result q's type");
  int64_t heads = getHeads(), members = getMembers();
  if (heads <= 0 || q[2] % heads != 0)
    return emitOpError("heads (") << heads << ") must divide hidden (" << q[2]
                                  << ")";
  int64_t d = q[2] / heads;
  if (k[2] == 0 || k[2] % d != 0 || heads % (k[2] / d) != 0)
    return emitOpError("k/v width ")
           << k[2] << " must be a number of key/value heads of " << d
           << " columns dividing heads (" << heads << ")";
  if (getRotary() && d % 2 != 0)
    return emitOpError("rotary needs an even head dim, got ") << d;
  if (members < 1)
    return emitOpError("members must be >= 1, got ") << members;
  if (q[1] % 2 != 0)
    return emitOpError("the sequence share ")
           << q[1] << " must be two equal chunks";
  if (getComm() != "ring" && getComm() != "a2a")
    return emitOpError("comm must be \"ring\" or \"a2a\", got \"")
           << getComm() << "\"";
  if (getComm() == "a2a" && (heads % members || (k[2] / d) % members))
    return emitOpError("comm \"a2a\" splits the heads over the cp group: ")
           << heads << " heads and " << k[2] / d
           << " key/value heads must be divisible by cp = " << members;
  return success();
}

// As attention over the whole sequence of the group, per member.
uint64_t CpAttentionOp::getFlops() {
  ArrayRef<int64_t> q = shapeOf(getQ());
  uint64_t n = 4ull * q[0] * q[1] * (q[1] * getMembers()) * q[2];
  return getCausal() ? n / 2 : n;
}
uint64_t CpAttentionGradOp::getFlops() {
  ArrayRef<int64_t> q = shapeOf(getQ());
  uint64_t n = 12ull * q[0] * q[1] * (q[1] * getMembers()) * q[2];
  return getCausal() ? n / 2 : n;
}

LogicalResult CpAttentionOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                           SmallVectorImpl<Value> &grads) {
  Type t = getQ().getType(), kv = getK().getType();
  auto g = b.create<CpAttentionGradOp>(
      getLoc(), TypeRange{t, kv, kv}, dys[0], getQ(), getK(), getV(),
      getHeadsAttr(), getScaleAttr(), getCausalAttr(), getRotaryAttr(),
      getRotaryBaseAttr(), getRotaryDimAttr(), getMembersAttr(), getCommAttr(),
      getGroupAttr());
  grads.append({g.getDq(), g.getDk(), g.getDv()});
  return success();
}
