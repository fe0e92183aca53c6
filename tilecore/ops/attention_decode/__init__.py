"""The split-key (decode) path of ``tilecore.attention``: few queries a sequence (decode, MLA decode's
576 / 512 over one latent), the keys split across programs and merged by lse (any device; attention's
plan routes these inputs here: plan.features, attention_decode.plan.decode_fits). No public function
of its own.

* ``plan``: which inputs it serves, its tiles and key ranges; ``configs``: the measured table;
* ``kernels_tl``: the split-key forward and the merge of its splits;
* ``launch``: launch_decode, the general path and the per-key recipe (_DecodeLaunch).
"""
