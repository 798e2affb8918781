"""`conveyor view RUN_DIR`: one self-contained HTML page to read an eval or training run.

`data` reads a run folder into plain JSON-able records, `tokens` lays each trajectory's turns out
as token sequences, `stats` computes the summary, and `page` writes the HTML with everything
(data, script, style) inline, so the file opens offline and sends no request.
"""
