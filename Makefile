PYTHON ?= .venv/bin/python

.PHONY: deb test-system

deb:
	packaging/build-deb.sh

test-system:
	$(PYTHON) -m pytest tests/system -q
