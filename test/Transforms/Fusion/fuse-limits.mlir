// RUN: mapp-opt %s -mapp-fuse -split-input-file | FileCheck %s

// A region stays within a fused program's limits (32 operands, 16 outputs,
// rank 8: the generated kernels' argument block, FusedDevice.h), which the
// verifier and the plan loader enforce: an MoE's 32 auxiliary losses summed
// in one chain once made a 33-operand region that the CUDA generator
// refused at run time.

// 40 values summed in a chain: a region of 31 adds over the first 32
// values, then one over the rest reading its result.
// CHECK-LABEL: func.func @long_sum
// CHECK: %[[A:.*]] = mapp.fused %arg0, %arg1, {{.*}}, %arg31 {{.*}}outputs = array<i64: 30>
// CHECK-NEXT: mapp.fused %[[A]], %arg32, {{.*}}, %arg39 {{.*}}outputs = array<i64: 7>
// CHECK-NEXT: return
func.func @long_sum(%x0: tensor<4xf32>, %x1: tensor<4xf32>, %x2: tensor<4xf32>, %x3: tensor<4xf32>, %x4: tensor<4xf32>, %x5: tensor<4xf32>, %x6: tensor<4xf32>, %x7: tensor<4xf32>, %x8: tensor<4xf32>, %x9: tensor<4xf32>, %x10: tensor<4xf32>, %x11: tensor<4xf32>, %x12: tensor<4xf32>, %x13: tensor<4xf32>, %x14: tensor<4xf32>, %x15: tensor<4xf32>, %x16: tensor<4xf32>, %x17: tensor<4xf32>, %x18: tensor<4xf32>, %x19: tensor<4xf32>, %x20: tensor<4xf32>, %x21: tensor<4xf32>, %x22: tensor<4xf32>, %x23: tensor<4xf32>, %x24: tensor<4xf32>, %x25: tensor<4xf32>, %x26: tensor<4xf32>, %x27: tensor<4xf32>, %x28: tensor<4xf32>, %x29: tensor<4xf32>, %x30: tensor<4xf32>, %x31: tensor<4xf32>, %x32: tensor<4xf32>, %x33: tensor<4xf32>, %x34: tensor<4xf32>, %x35: tensor<4xf32>, %x36: tensor<4xf32>, %x37: tensor<4xf32>, %x38: tensor<4xf32>, %x39: tensor<4xf32>) -> tensor<4xf32> {
  %s1 = mapp.add %x0, %x1 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s2 = mapp.add %s1, %x2 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s3 = mapp.add %s2, %x3 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s4 = mapp.add %s3, %x4 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s5 = mapp.add %s4, %x5 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s6 = mapp.add %s5, %x6 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s7 = mapp.add %s6, %x7 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s8 = mapp.add %s7, %x8 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s9 = mapp.add %s8, %x9 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s10 = mapp.add %s9, %x10 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s11 = mapp.add %s10, %x11 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s12 = mapp.add %s11, %x12 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s13 = mapp.add %s12, %x13 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s14 = mapp.add %s13, %x14 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s15 = mapp.add %s14, %x15 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s16 = mapp.add %s15, %x16 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s17 = mapp.add %s16, %x17 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s18 = mapp.add %s17, %x18 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s19 = mapp.add %s18, %x19 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s20 = mapp.add %s19, %x20 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s21 = mapp.add %s20, %x21 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s22 = mapp.add %s21, %x22 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s23 = mapp.add %s22, %x23 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s24 = mapp.add %s23, %x24 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s25 = mapp.add %s24, %x25 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s26 = mapp.add %s25, %x26 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s27 = mapp.add %s26, %x27 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s28 = mapp.add %s27, %x28 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s29 = mapp.add %s28, %x29 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s30 = mapp.add %s29, %x30 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s31 = mapp.add %s30, %x31 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s32 = mapp.add %s31, %x32 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s33 = mapp.add %s32, %x33 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s34 = mapp.add %s33, %x34 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s35 = mapp.add %s34, %x35 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s36 = mapp.add %s35, %x36 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s37 = mapp.add %s36, %x37 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s38 = mapp.add %s37, %x38 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s39 = mapp.add %s38, %x39 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %s39 : tensor<4xf32>
}

// -----

// A domain of rank 9 is not fused.
// CHECK-LABEL: func.func @rank9
// CHECK-NOT: mapp.fused
func.func @rank9(%x: tensor<1x1x1x1x1x1x1x2x2xf32>) -> tensor<1x1x1x1x1x1x1x2x2xf32> {
  %a = mapp.exp %x : tensor<1x1x1x1x1x1x1x2x2xf32>
  %b = mapp.tanh %a : tensor<1x1x1x1x1x1x1x2x2xf32>
  return %b : tensor<1x1x1x1x1x1x1x2x2xf32>
}
