// RUN: mapp-opt %s -split-input-file -verify-diagnostics

mapp.param @m : tensor<15xf32> {init = "fp8_meta"}
func.func @bad_format(%x: tensor<4x32xf32>, %w: tensor<16x32xf32>, %m: tensor<15xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{fp8 format must be "e4m3" or "e5m2", got "e3m4"}}
  %y = mapp.fp8_linear %x, %w meta(%m) {fp8_a = "e3m4", fp8_b = "e4m3", meta_a = 0, meta_b = 1} : (tensor<4x32xf32>, tensor<16x32xf32>, tensor<15xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}

// -----

func.func @two_e5m2(%a: tensor<4x16xf32>, %b: tensor<16x32xf32>, %m: tensor<15xf32>) -> tensor<4x32xf32> {
  // expected-error @+1 {{an e5m2 x e5m2 product has no fp8 GEMM}}
  %y = mapp.fp8_matmul %a, %b meta(%m) {fp8_a = "e5m2", fp8_b = "e5m2", meta_a = 2, meta_b = 1} : (tensor<4x16xf32>, tensor<16x32xf32>, tensor<15xf32>) -> tensor<4x32xf32>
  return %y : tensor<4x32xf32>
}

// -----

func.func @bad_meta(%x: tensor<4x32xf32>, %w: tensor<16x32xf32>, %m: tensor<3x5xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{meta must be f32[3 * (1 + history)]}}
  %y = mapp.fp8_linear %x, %w meta(%m) {fp8_a = "e4m3", fp8_b = "e4m3", meta_a = 0, meta_b = 1} : (tensor<4x32xf32>, tensor<16x32xf32>, tensor<3x5xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}

// -----

func.func @bad_row(%x: tensor<4x32xf32>, %w: tensor<16x32xf32>, %m: tensor<15xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{meta rows are 0, 1 or 2, got 3}}
  %y = mapp.fp8_linear %x, %w meta(%m) {fp8_a = "e4m3", fp8_b = "e4m3", meta_a = 3, meta_b = 1} : (tensor<4x32xf32>, tensor<16x32xf32>, tensor<15xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}

// -----

func.func @wgrad_rank(%a: tensor<2x4x16xf32>, %b: tensor<4x32xf32>, %m: tensor<15xf32>) -> tensor<2x16x32xf32> {
  // expected-error @+1 {{a must have rank >= 2 (exactly 2 with transpose_a) and b rank 2}}
  %y = mapp.fp8_matmul %a, %b meta(%m) {fp8_a = "e5m2", fp8_b = "e4m3", meta_a = 2, meta_b = 0, transpose_a} : (tensor<2x4x16xf32>, tensor<4x32xf32>, tensor<15xf32>) -> tensor<2x16x32xf32>
  return %y : tensor<2x16x32xf32>
}

// -----

mapp.param @m : tensor<15xf32> {init = "fp8_meta"}
func.func @optimizer_step() {
  // expected-error @+1 {{parameter @m must be f32[9] (3 rows of scale + history 2), got 'tensor<15xf32>'}}
  mapp.fp8_update @m {format_x = "e4m3", format_w = "e4m3", format_dy = "e5m2", history = 2, margin = 0}
  return
}

// -----

mapp.param @m : tensor<15xf32> {init = "fp8_meta"}
func.func @optimizer_step() {
  // expected-error @+1 {{history must be >= 1, got 0}}
  mapp.fp8_update @m {format_x = "e4m3", format_w = "e4m3", format_dy = "e5m2", history = 0, margin = 0}
  return
}

// -----

func.func @w_shape(%x: tensor<4x32xf32>, %w: tensor<16x30xf32>, %m: tensor<15xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{weight must be [out, in] with in = x's last dim}}
  %y = mapp.fp8_linear %x, %w meta(%m) {fp8_a = "e4m3", fp8_b = "e4m3", meta_a = 0, meta_b = 1} : (tensor<4x32xf32>, tensor<16x30xf32>, tensor<15xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}

// -----

func.func @y_shape(%x: tensor<4x32xf32>, %w: tensor<16x32xf32>, %m: tensor<15xf32>) -> tensor<4x15xf32> {
  // expected-error @+1 {{result must be [4,16], got [4,15]}}
  %y = mapp.fp8_linear %x, %w meta(%m) {fp8_a = "e4m3", fp8_b = "e4m3", meta_a = 0, meta_b = 1} : (tensor<4x32xf32>, tensor<16x32xf32>, tensor<15xf32>) -> tensor<4x15xf32>
  return %y : tensor<4x15xf32>
}

// -----

func.func @bias_shape(%x: tensor<4x32xf32>, %w: tensor<16x32xf32>, %b: tensor<15xf32>, %m: tensor<15xf32>) -> tensor<4x16xf32> {
  // expected-error @+1 {{bias must be [16]}}
  %y = mapp.fp8_linear %x, %w, %b meta(%m) {fp8_a = "e4m3", fp8_b = "e4m3", meta_a = 0, meta_b = 1} : (tensor<4x32xf32>, tensor<16x32xf32>, tensor<15xf32>, tensor<15xf32>) -> tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}

// -----

func.func @contraction(%a: tensor<4x16xf32>, %b: tensor<17x32xf32>, %m: tensor<15xf32>) -> tensor<4x32xf32> {
  // expected-error @+1 {{contraction dims differ: 16 vs 17}}
  %y = mapp.fp8_matmul %a, %b meta(%m) {fp8_a = "e5m2", fp8_b = "e4m3", meta_a = 2, meta_b = 1} : (tensor<4x16xf32>, tensor<17x32xf32>, tensor<15xf32>) -> tensor<4x32xf32>
  return %y : tensor<4x32xf32>
}

// -----

func.func @mm_result(%a: tensor<4x16xf32>, %b: tensor<16x32xf32>, %m: tensor<15xf32>) -> tensor<4x31xf32> {
  // expected-error @+1 {{result must be [4,32], got [4,31]}}
  %y = mapp.fp8_matmul %a, %b meta(%m) {fp8_a = "e5m2", fp8_b = "e4m3", meta_a = 2, meta_b = 1} : (tensor<4x16xf32>, tensor<16x32xf32>, tensor<15xf32>) -> tensor<4x31xf32>
  return %y : tensor<4x31xf32>
}

// -----

mapp.param @m : tensor<15xf32> {init = "fp8_meta"}
func.func @optimizer_step() {
  // expected-error @+1 {{margin must be >= 0, got -1}}
  mapp.fp8_update @m {format_x = "e4m3", format_w = "e4m3", format_dy = "e5m2", history = 4, margin = -1}
  return
}

// -----

mapp.param @m : tensor<15xf32> {init = "fp8_meta"}
func.func @optimizer_step() {
  // expected-error @+1 {{fp8 format must be "e4m3" or "e5m2", got "e2m5"}}
  mapp.fp8_update @m {format_x = "e4m3", format_w = "e4m3", format_dy = "e2m5", history = 4, margin = 0}
  return
}

// -----

func.func @optimizer_step() {
  // expected-error @+1 {{refers to unknown parameter @nope}}
  mapp.fp8_update @nope {format_x = "e4m3", format_w = "e4m3", format_dy = "e5m2", history = 4, margin = 0}
  return
}
