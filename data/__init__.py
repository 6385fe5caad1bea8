"""Data pipeline: offline assets, tokenizers, the shard format, corpus preparation and the
distributed token loader.

    corpus --data/prepare.py--> shards (data/shards.py) --data/loader.py--> (x, y) per rank
"""
