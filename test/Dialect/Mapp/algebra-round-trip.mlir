// RUN: mapp-opt %s | mapp-opt | FileCheck %s
// RUN: mapp-opt %s -mlir-print-op-generic | mapp-opt | FileCheck %s
// The tensor algebra of MappTensorOps.td in its custom and generic forms.

// CHECK-LABEL: func.func @algebra
func.func @algebra(%x: tensor<2x4xf32>, %y: tensor<2x4xf32>, %r: tensor<4xf32>, %ids: tensor<2x4xi32>) -> tensor<2x4xf32> {
  // CHECK: mapp.neg %{{.*}} : tensor<2x4xf32>
  %0 = mapp.neg %x : tensor<2x4xf32>
  // CHECK: mapp.exp
  %1 = mapp.exp %0 : tensor<2x4xf32>
  // CHECK: mapp.log
  %2 = mapp.log %1 : tensor<2x4xf32>
  // CHECK: mapp.rsqrt
  %3 = mapp.rsqrt %1 : tensor<2x4xf32>
  // CHECK: mapp.sin
  %4 = mapp.sin %3 : tensor<2x4xf32>
  // CHECK: mapp.pow %{{.*}} {exponent = 2.500000e+00 : f64} : tensor<2x4xf32>
  %5 = mapp.pow %1 {exponent = 2.5 : f64} : tensor<2x4xf32>
  // CHECK: mapp.sub %{{.*}}, %{{.*}} : tensor<2x4xf32>
  %6 = mapp.sub %5, %4 : tensor<2x4xf32>
  // CHECK: mapp.div
  %7 = mapp.div %6, %y : tensor<2x4xf32>
  // CHECK: mapp.maximum
  %8 = mapp.maximum %7, %2 : tensor<2x4xf32>
  // CHECK: mapp.lt
  %9 = mapp.lt %8, %y : tensor<2x4xf32>
  // CHECK: mapp.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<2x4xf32>
  %10 = mapp.select %9, %8, %y : tensor<2x4xf32>
  // CHECK: mapp.broadcast %{{.*}} : (tensor<4xf32>) -> tensor<2x4xf32>
  %11 = mapp.broadcast %r : (tensor<4xf32>) -> tensor<2x4xf32>
  // CHECK: mapp.constant {value = dense<{{.*}}> : tensor<2x4xf32>} : tensor<2x4xf32>
  %12 = mapp.constant {value = dense<[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]> : tensor<2x4xf32>} : tensor<2x4xf32>
  // CHECK: mapp.cast %{{.*}} : (tensor<2x4xi32>) -> tensor<2x4xf32>
  %13 = mapp.cast %ids : (tensor<2x4xi32>) -> tensor<2x4xf32>
  %14 = mapp.sigmoid %13 : tensor<2x4xf32>
  %15 = mapp.tanh %14 : tensor<2x4xf32>
  %16 = mapp.abs %15 : tensor<2x4xf32>
  %17 = mapp.sign %16 : tensor<2x4xf32>
  %18 = mapp.cos %17 : tensor<2x4xf32>
  %19 = mapp.sqrt %18 : tensor<2x4xf32>
  %20 = mapp.minimum %19, %12 : tensor<2x4xf32>
  %21 = mapp.le %20, %11 : tensor<2x4xf32>
  %22 = mapp.gt %21, %11 : tensor<2x4xf32>
  %23 = mapp.ge %22, %11 : tensor<2x4xf32>
  %24 = mapp.eq %23, %11 : tensor<2x4xf32>
  %25 = mapp.ne %24, %10 : tensor<2x4xf32>
  // CHECK: mapp.ne
  return %25 : tensor<2x4xf32>
}
