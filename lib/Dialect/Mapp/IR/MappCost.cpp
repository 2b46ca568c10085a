// The cost interface: FLOPs of each op (bytes default to operand/result sizes).
#include "mapp/Dialect/Mapp/IR/MappOps.h"

using namespace mlir;
using namespace mapp;

#include "mapp/Dialect/Mapp/IR/MappOpInterfaces.cpp.inc"

uint64_t mapp::tensorBytes(Type type) {
  auto t = dyn_cast<RankedTensorType>(type);
  if (!t || !t.hasStaticShape())
    return 0;
  return (uint64_t)t.getNumElements() *
         ((t.getElementTypeBitWidth() + 7) / 8);
}

uint64_t mapp::sumTensorBytes(ValueRange values) {
  uint64_t total = 0;
  for (Value v : values)
    total += tensorBytes(v.getType());
  return total;
}

static uint64_t numel(Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  return t.hasStaticShape() ? (uint64_t)t.getNumElements() : 0;
}
static int64_t lastDim(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape().back();
}

// Data movement only.
uint64_t EmbeddingOp::getFlops() { return 0; }
uint64_t ReshapeOp::getFlops() { return 0; }
uint64_t TransposeOp::getFlops() { return 0; }
uint64_t SliceOp::getFlops() { return 0; }
uint64_t SliceGradOp::getFlops() { return 0; }
uint64_t ConcatOp::getFlops() { return 0; }
uint64_t FillOp::getFlops() { return 0; }
uint64_t AllGatherOp::getFlops() { return 0; }
uint64_t AllToAllOp::getFlops() { return 0; }
uint64_t SendOp::getFlops() { return 0; }
uint64_t RecvOp::getFlops() { return 0; }

uint64_t EmbeddingGradOp::getFlops() { return numel(getDy()); }
uint64_t LinearOp::getFlops() {
  return 2 * numel(getResult()) * lastDim(getX()) +
         (getBias() ? numel(getResult()) : 0);
}
uint64_t MatmulOp::getFlops() {
  auto a = cast<RankedTensorType>(getA().getType()).getShape();
  int64_t k = getTransposeA() ? a[a.size() - 2] : a.back();
  return 2 * numel(getResult()) * k;
}
uint64_t Fp8LinearOp::getFlops() {
  return 2 * numel(getResult()) * lastDim(getX()) +
         (getBias() ? numel(getResult()) : 0);
}
uint64_t Fp8MatmulOp::getFlops() {
  auto a = cast<RankedTensorType>(getA().getType()).getShape();
  int64_t k = getTransposeA() ? a[a.size() - 2] : a.back();
  return 2 * numel(getResult()) * k;
}
uint64_t ReduceSumOp::getFlops() { return numel(getX()); }
uint64_t ReduceMaxOp::getFlops() { return numel(getX()); }
uint64_t VocabCEPartialsOp::getFlops() { return 4 * numel(getLogits()); }
uint64_t VocabCEPartialsGradOp::getFlops() { return 4 * numel(getLogits()); }
uint64_t CEFromPartialsOp::getFlops() { return 4 * numel(getPartials()); }
uint64_t CEFromPartialsGradOp::getFlops() { return 4 * numel(getPartials()); }
uint64_t CopyToGroupOp::getFlops() { return 0; }
uint64_t ScatterToGroupOp::getFlops() { return 0; }
uint64_t AddOp::getFlops() { return numel(getResult()); }
uint64_t MulOp::getFlops() { return numel(getResult()); }
uint64_t ScaleOp::getFlops() { return numel(getResult()); }
uint64_t GeluOp::getFlops() { return 8 * numel(getResult()); }
uint64_t GeluGradOp::getFlops() { return 12 * numel(getResult()); }
uint64_t SiluOp::getFlops() { return 4 * numel(getResult()); }
uint64_t SiluGradOp::getFlops() { return 6 * numel(getResult()); }
uint64_t SoftcapOp::getFlops() { return 4 * numel(getResult()); }
uint64_t SoftcapGradOp::getFlops() { return 5 * numel(getResult()); }
uint64_t LayerNormOp::getFlops() { return 8 * numel(getResult()); }
uint64_t LayerNormGradOp::getFlops() { return 16 * numel(getDx()); }
uint64_t RMSNormOp::getFlops() { return 5 * numel(getResult()); }
uint64_t RMSNormGradOp::getFlops() { return 10 * numel(getDx()); }
uint64_t SoftmaxOp::getFlops() { return 5 * numel(getResult()); }
uint64_t SoftmaxGradOp::getFlops() { return 4 * numel(getResult()); }
uint64_t DropoutOp::getFlops() { return 2 * numel(getResult()); }
uint64_t DropoutGradOp::getFlops() { return 2 * numel(getResult()); }
uint64_t CrossEntropyOp::getFlops() { return 5 * numel(getLogits()); }
uint64_t CrossEntropyGradOp::getFlops() { return 5 * numel(getLogits()); }
uint64_t GlobalNormOp::getFlops() { return 2 * sumTensorBytes(getGrads()) / 4; }
uint64_t AdamWOp::getFlops() { return 12 * numel(getGrad()); }
uint64_t SGDOp::getFlops() { return 4 * numel(getGrad()); }
// Updates write in place: the parameter and its state buffers.
uint64_t AdamWOp::getBytesWritten() { return 3 * tensorBytes(getGrad().getType()); }
uint64_t SGDOp::getBytesWritten() { return 2 * tensorBytes(getGrad().getType()); }
uint64_t AllReduceOp::getFlops() { return numel(getX()); }
uint64_t ReduceScatterOp::getFlops() { return numel(getX()); }

/// Attention: q·kᵀ and p·v, 2·B·T·T·H each (halved when causal), plus softmax.
static uint64_t attentionFlops(Value q, bool causal) {
  auto s = cast<RankedTensorType>(q.getType()).getShape();
  uint64_t b = s[0], t = s[1], h = s[2];
  uint64_t matmuls = 4 * b * t * t * h;
  return (causal ? matmuls / 2 : matmuls) + 5 * b * t * t;
}
uint64_t AttentionOp::getFlops() { return attentionFlops(getQ(), getCausal()); }
uint64_t AttentionGradOp::getFlops() {
  // Recompute of the probabilities plus four matmuls of the backward.
  return 3 * attentionFlops(getQ(), getCausal());
}
