"""The measured cases of attention(..., rotary=(cos, sin)): which calls take the Gluon forward that turns Q
(and K) inside its launch, and the tl kernels' stages with Q and K turned inside."""

# On Hopper (plan.rotary_path): (head dim, causal) of the Gluon forward's
# calls without a gradient that take gluon_forward.forward (K by apply_rotary's pass, Q turned in the Gluon
# kernel), the others the turned forward (q and k by apply_rotary's passes, then the shipped forward): the
# cases where it ran faster (per-case figures: notes/rotary's decision log)
ROTARY_IN_KERNEL_CASES = frozenset({(128, False), (128, True), (64, True)})
# (head dim, causal) of the calls recording a gradient whose turned forward is gluon_forward's (K by apply_rotary's
# pass, Q turned in the Gluon forward and stored from there for the backward: no pass over Q); else q and k by
# apply_rotary's passes, then the shipped forward. D128: its training forward 2.8-3.1% faster (notes/rotary)
ROTARY_TRAIN_IN_KERNEL_CASES: frozenset = frozenset({(128, False), (128, True)})
# (head dim, causal) of gluon_forward.forward whose K is turned inside its launch (gluon_forward.KTurn: side items
# of the persistent schedule, on some SMs while others run tiles) instead of by apply_rotary's pass before it;
# the items' ring steps (2 block_n rows each), their lead (in grids of tiles before a head's first tile), and
# a step's cost in attention steps for the balanced deal (plan.rotary_overlap_table: one SM turns a D128 step in
# 2.54 us, an attention step takes 1.46: 1.75). D128 causal: no-grad forward 1.030x / 1.018x the pass's, training
# forward 1.031x / 1.020x (two runs); D128 full and D64 lost (notes/rotary)
ROTARY_K_OVERLAP_CASES: frozenset = frozenset({(128, True)})
ROTARY_K_OVERLAP_ITEM_STEPS = 4
ROTARY_K_OVERLAP_LEAD = 4.0
ROTARY_K_OVERLAP_ITEM_COST = 1.75
# The tl kernels with Q and K turned inside (kernels_tl ROTARY): software-pipelining stages. The turned
# K's partner columns and its cos / sin rows (float32) are pipelined with K and V: the forward at D128 asked
# 240 KiB of shared memory with the tl table's 3 stages (the H100 has 227) and 144 KiB with 2 (past
# sm_86's 99); one stage asks 48-64 KiB at D <= 128, which every GPU the plans serve has. Untimed.
ROTARY_TL_STAGES = 1
