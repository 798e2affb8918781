"""Conveyor: efficient RL training and evaluation of multi-turn, tool-using LLM agents.

Importing the package stays light: torch, vllm and ray are imported only by the modules that
need them.
"""

__version__ = "0.1.0"
