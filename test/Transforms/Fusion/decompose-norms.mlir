// RUN: mapp-opt %s -mapp-decompose-norms | FileCheck %s
// RUN: mapp-opt %s -mapp-decompose-norms -mapp-fuse | FileCheck %s --check-prefix=FUSED

// --mapp-decompose-norms writes each norm with the algebra, as the exporter
// writes one it does not recognize; the pieces keep the norm's attributes.
// Fused, each norm is one row program (docs/fusion.md, "Norms from the
// algebra").

// CHECK-LABEL: func.func @norms
// CHECK-NOT: mapp.rms_norm
// CHECK: %[[SQ:.*]] = mapp.pow %arg0 {exponent = 2.000000e+00 : f64, mapp.name = "layers.0.norm"}
// CHECK-NEXT: %[[SS:.*]] = mapp.reduce_sum %[[SQ]] {dims = array<i64: 2>, mapp.name = "layers.0.norm"}
// CHECK-NEXT: %[[K:.*]] = mapp.reshape %[[SS]] {{.*}} -> tensor<2x4x1xf32>
// CHECK-NEXT: %[[M:.*]] = mapp.scale %[[K]] {factor = 1.250000e-01 : f64
// CHECK-NEXT: %[[E:.*]] = mapp.fill 9.9999999999999995E-7
// CHECK-NEXT: %[[V:.*]] = mapp.add %[[M]], %[[E]]
// CHECK-NEXT: %[[R:.*]] = mapp.rsqrt %[[V]]
// CHECK-NEXT: %[[RB:.*]] = mapp.broadcast %[[R]] {{.*}} -> tensor<2x4x8xf32>
// CHECK-NEXT: %[[N:.*]] = mapp.mul %arg0, %[[RB]]
// Gemma's gain, 1 + weight:
// CHECK-NEXT: %[[ONE:.*]] = mapp.fill 1.000000e+00
// CHECK-NEXT: %[[G:.*]] = mapp.add %arg1, %[[ONE]]
// CHECK-NEXT: %[[Y:.*]] = mapp.mul %[[N]], %[[G]]
// The LayerNorm: the mean, x − mean, its mean square, rsqrt, gain and bias.
// CHECK-NEXT: mapp.reduce_sum %arg0 {dims = array<i64: 2>}
// CHECK: %[[XC:.*]] = mapp.sub %arg0
// CHECK-NEXT: mapp.mul %[[XC]], %[[XC]]
// CHECK: mapp.rsqrt
// CHECK: %[[Z:.*]] = mapp.add %{{.*}}, %arg2
// CHECK-NEXT: return %[[Y]], %[[Z]]

// FUSED-LABEL: func.func @norms
// FUSED: mapp.fused {{.*}} program = "pow[2](%i0); reduce_sum[2](%0); row scale[0.125](%1); row add(%2, %i1); row rsqrt(%3); mul(%i0, %4); mul(%5, %i2)"
// FUSED: mapp.fused {{.*}} program = "reduce_sum[2](%i0); row scale[0.125](%0); sub(%i0, %1); mul(%2, %2); reduce_sum[2](%3); row scale[0.125](%4); row add(%5, %i1); row rsqrt(%6); mul(%2, %7); mul(%8, %i2); add(%9, %i3)"
// FUSED-NEXT: return
func.func @norms(%x: tensor<2x4x8xf32>, %g: tensor<8xf32>, %b: tensor<8xf32>)
    -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>) {
  %y = mapp.rms_norm %x, %g {eps = 1.0e-6 : f64, weight_offset = 1.0 : f64, mapp.name = "layers.0.norm"} : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %z = mapp.layer_norm %x, %g, %b {eps = 1.0e-5 : f64} : (tensor<2x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  return %y, %z : tensor<2x4x8xf32>, tensor<2x4x8xf32>
}
