"""Tuning heads for where they run: the measurements that fill a heads folder's tree.json.

`calibrate` (the tree with the best expected tokens per second, per temperature), `batch_plan`
(at which batch sizes speculation still pays), `training` (the trees heads leave training with)
and `tables` (their results as tree.json entries). The file's format, reading and writing are
`draftheads.plans`, below the heads and the decoder that read it; this layer sits above the
decoder, whose decoding it times.
"""
