"""The app's helpers, apart from its pages (pages/ holds only the pages app.py lists).

config (settings and limits), shared (the process-wide objects: the fair model turn, the model
store, the session records), state (the session's typed state), record (what a reload restores),
experiment (one model job: the turn, progress, the budget note, the error message), replay, memo,
files, links, present, and the pages' sections (ui/sections/). Nothing here imports torch: the
engine runs the model; these helpers only ask it to.
"""
