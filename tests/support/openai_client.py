"""An OpenAI-style client as a ``command`` profile runs it: one chat completion through
``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY`` (the relay's dummy), the answer written to
ANSWER.txt and the key it was given to KEY_SEEN.txt, the result as the last stdout line.

``python3 openai_client.py [EXTRA_JSON]``: EXTRA_JSON is merged into the output.
"""

import json
import os
import sys
import urllib.request

request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
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
extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
print("working...")
print(json.dumps({"output": {"summary": text, **extra}, "handoff": "from the client"}))
