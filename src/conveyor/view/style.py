"""The page's CSS, inlined into the HTML (the page loads nothing from anywhere)."""

STYLE = """
:root { --fg: #1d2330; --muted: #6a7385; --line: #dfe3ea; --bg: #f7f8fa; --accent: #2f6fdf; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; gap: 18px; align-items: baseline; padding: 10px 18px; background: #fff;
  border-bottom: 1px solid var(--line); position: sticky; top: 0; z-index: 2; }
header h1 { font-size: 16px; margin: 0; }
header nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
header nav a.active { font-weight: 600; text-decoration: underline; }
main { padding: 14px 18px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px;
  margin-bottom: 14px; }
h2 { font-size: 15px; margin: 4px 0 8px; } h3 { font-size: 14px; margin: 10px 0 6px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left; }
th { color: var(--muted); font-weight: 500; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: var(--muted); } .warn { color: #a4471a; }
.chip { display: inline-block; padding: 0 7px; border-radius: 9px; margin-right: 5px;
  font-size: 12px; background: #eef1f6; }
.st-ok { background: #dcf3e3; } .st-truncated { background: #fdf0cf; }
.st-policy_error { background: #fbdede; } .st-timeout { background: #f3e3fb; }
.st-infra_error { background: #e0e0e0; }
.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin-bottom: 8px; }
.filters label { font-size: 12px; color: var(--muted); }
tr.traj-row { cursor: pointer; } tr.traj-row:hover { background: #eef3fd; }
.charts { display: flex; flex-wrap: wrap; gap: 14px; }
svg text { font: 11px system-ui, sans-serif; fill: var(--muted); }
.msg { border-left: 3px solid var(--line); padding: 4px 10px; margin: 6px 0; }
.msg pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0; font-size: 12px; }
.msg.role-assistant { border-color: #2f6fdf; } .msg.role-tool { border-color: #8a5cd6; }
.msg.role-user { border-color: #2b9a5b; } .msg.role-answer { border-color: #d08a12; }
.msg.hint { background: #fff7e0; }
.tokens { font: 12px/1.7 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all;
  border: 1px solid var(--line); padding: 6px; max-height: 70vh; overflow: auto; }
.tok { border-radius: 2px; }
.mode-mask .tok[data-mask="1"] { background: #cfe3ff; }
.mode-mask .tok.ctx { color: #8b93a3; }
.mode-logprob .tok.gen { background: var(--lp); }
.mode-logprob .tok.ctx { color: #a6adba; }
.mode-gap .tok.gen { background: var(--gap, transparent); }
.mode-gap .tok.ctx { color: #a6adba; }
.turn-mark { display: inline-block; font: 10px system-ui, sans-serif; color: #fff;
  background: #55607a; border-radius: 3px; padding: 0 4px; margin: 0 3px; }
.sample-head { font-weight: 600; margin: 10px 0 4px; }
.tokinfo { position: sticky; bottom: 0; background: #fff; border-top: 1px solid var(--line);
  padding: 4px 0; font: 12px ui-monospace, monospace; min-height: 1.6em; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
.legend span { margin-right: 12px; font-size: 12px; }
"""
