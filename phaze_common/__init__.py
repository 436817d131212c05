"""Helpers every layer of phaze uses: files written whole, warnings given once, progress of long
work, the checks of user input, and CP-SAT's threads for the exact searches. Nothing here knows about models, chips or placements."""
