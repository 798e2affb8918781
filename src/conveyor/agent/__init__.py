"""The agent: the tool-calling loop, hints, context management, tools, chat rendering."""
