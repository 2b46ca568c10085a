mapp.param @w : tensor<4x8xf32>
func.func @forward(%t: tensor<2x8xi32>, %g: tensor<2xi32>) -> tensor<f32> {
  %x = mapp.fill 1.0 : tensor<2x8xf32>
  %w = mapp.param_ref @w : tensor<4x8xf32>
  %y = mapp.linear %x, %w {mapp.name = "head"} : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %y, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
