"""The reward command of configs/usertasks-agents.yaml: 1.0 when the last number of the
agent's answer equals the task's `data.answer`, else 0.0. Reads {"task_id", "prompt", "data",
"answer"} as JSON on stdin; prints the reward on its last line."""

import json
import re
import sys

asked = json.load(sys.stdin)
numbers = re.findall(r"-?\d+(?:\.\d+)?", asked["answer"] or "")
print(1.0 if numbers and float(numbers[-1]) == float(asked["data"]["answer"]) else 0.0)
