"""An OpenAI-style client as a ``command`` profile runs it: one chat completion through
``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY`` (the relay's dummy), the answer written to
ANSWER.txt and the key it was given to KEY_SEEN.txt, the result as the last stdout line.

``python3 openai_client.py [--base-url URL] [EXTRA_JSON]``: URL instead of
``$OPENAI_BASE_URL`` (as codex takes it, in a ``-c`` setting), written to
BASE_SEEN.txt; EXTRA_JSON is merged into the output. What its profile gave it (the
``CLIENT_*`` variables of its ``env``, and ``~/.config/client/config.json`` from its
``profiles.d/NAME.d``) goes to PROFILE_SEEN.json. Like many CLIs it leaves a history of
its own in the project, ``.client-history``.
"""

import json
import os
import sys
import urllib.request
from pathlib import Path

args = sys.argv[1:]
base = os.environ["OPENAI_BASE_URL"]
if args[:1] == ["--base-url"]:
    base, args = args[1], args[2:]
    with open("BASE_SEEN.txt", "w") as fh:
        fh.write(base)
request = urllib.request.Request(
    base + "/chat/completions",
    data=json.dumps({"model": "gpt-whatever",
                     "messages": [{"role": "user", "content": os.environ["CAIRN_PROMPT"]}]}
                    ).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=30))
text = reply["choices"][0]["message"]["content"]
with open("ANSWER.txt", "w") as fh:
    fh.write(text)
with open("KEY_SEEN.txt", "w") as fh:
    fh.write(os.environ["OPENAI_API_KEY"])
config = os.path.expanduser("~/.config/client/config.json")
with open("PROFILE_SEEN.json", "w") as fh:
    json.dump({"env": {k: v for k, v in os.environ.items() if k.startswith("CLIENT_")},
               "home": os.environ["HOME"],
               "config": Path(config).read_text() if os.path.exists(config) else None}, fh)
with open(".client-history", "a") as fh:
    fh.write(os.environ["CAIRN_PROMPT"] + "\n")
extra = json.loads(args[0]) if args else {}
print("working...")
print(json.dumps({"output": {"summary": text, **extra}, "handoff": "from the client"}))
