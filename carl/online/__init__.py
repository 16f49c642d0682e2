"""carl's production loop: serve the agent to users, store every session and signal, train on them."""
