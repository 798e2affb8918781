"""Code search: the AST index of a repository, its ranking and the agent's `search_code` tool."""
