// RUN: not mapp-opt %s -mapp-insert-trace="granularity=kernel" 2>&1 | FileCheck %s --check-prefix=GRAN
// RUN: not mapp-opt %s -mapp-insert-trace="every=4 window=5" 2>&1 | FileCheck %s --check-prefix=WIN
// RUN: not mapp-opt %s -mapp-insert-trace 2>&1 | FileCheck %s --check-prefix=NONE

// GRAN: error: mapp-insert-trace: granularity must be op, layer or stage, got 'kernel'
// WIN: error: mapp-insert-trace: need every >= 0 and 1 <= window <= every
// NONE: error: mapp-insert-trace: no plan block (mapp.phase) to trace

func.func @f() {
  return
}
