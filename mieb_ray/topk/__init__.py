"""The one top-k engine: the corpus laid out once in group-aligned partitions, score tasks per query block x
partition, partial results merged in a tree. Rules in `kernels` (pure), Ray in `engine`."""
