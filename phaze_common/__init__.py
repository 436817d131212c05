"""Helpers every layer of phaze uses: files written whole, warnings given once, progress of long
work, and the checks of user input. Nothing here knows about models, chips or placements."""
