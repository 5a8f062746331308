"""Sharded data parallelism, ZeRO stages 1 to 3 (``tnt.Model(...,
zero_stage=N)``): shards.py cuts the variables into the ranks' parts and
makes the optimizer update them (every stage); checkpoint.py writes and
reads files whole from the parts; steps.py runs stage 3's steps on the
weights gathered from the parts."""
