"""Developer tools that read the conveyor source: the import graph, the layer rules, the picture.

Nothing here imports the packages it analyses; it parses their source with `ast`, so the checks
run without torch, vllm or ray and cannot be fooled by import side effects.
"""
