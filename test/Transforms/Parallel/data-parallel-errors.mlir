// RUN: mapp-opt %s -split-input-file -mapp-data-parallel="dp=2 zero1=true" -verify-diagnostics

// expected-error @+1 {{mapp-data-parallel: no backward function (mapp.phase = "backward"); run --mapp-autodiff first}}
module {
}

// -----

// expected-error @+1 {{mapp-data-parallel: zero1 shards the optimizer state: run --mapp-optimizer first}}
module {
  mapp.param @w : tensor<4xf32>
  func.func @train_backward(%g: tensor<4xf32>) attributes {mapp.phase = "backward"} {
    mapp.grad_accumulate @w, %g : tensor<4xf32>
    return
  }
}
