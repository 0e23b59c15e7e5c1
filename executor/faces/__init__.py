"""What people and agents use: the command line, the MCP server, the views both answer with, what
both take in (inputs), and the pytest fixture that runs a runbook offline (testing).
"""
