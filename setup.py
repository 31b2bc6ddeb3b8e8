from pathlib import Path

from setuptools import find_packages, setup

# image models: TorchServe's vision handlers, handlers/micro_batching_handler.py and the
# image examples (torchvision's models and transforms, PIL's decoding)
IMAGES = ["torchvision>=0.19,<0.30", "pillow>=10"]
# ts_microbatch.tools: server/serve watch processes (psutil), scrape parses /metrics
# (prometheus_client); a worker imports neither (TorchServe brings its own psutil)
TOOLS = ["psutil>=5.9", "prometheus_client>=0.17"]
# benchmarks/: the studies draw their plots (matplotlib)
BENCH = ["matplotlib>=3.7", "requests>=2.31"]
# examples/bert_classifier: the model, and the tokenizer trained at build time
TEXT = ["transformers>=4.40", "tokenizers>=0.19"]

setup(
    name="ts_microbatch",
    version="0.1.0",
    description=(
        "Micro-batching for TorchServe handlers: pipelined stages, per-request errors, metrics"
    ),
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ts_microbatch", "ts_microbatch.*"]),
    # agent/*.jar: built by `make agent` (a JDK) before the wheel; missing without one
    package_data={
        "ts_microbatch": ["py.typed", "tools/metrics.yaml", "agent/*.jar", "agent/README.md"]
    },
    # The two stacks CI tests, and what lies between them: the official TorchServe 0.12.0
    # image's Python 3.9 with torch 2.4.0 / torchvision 0.19.0, and Python 3.11 with torch
    # 2.14.1 / torchvision 0.29.1 (tests/tools/test_floor.py holds these to the Makefile's pins).
    python_requires=">=3.9,<3.12",
    # What every handler's worker needs; the package imports neither torchvision nor Pillow
    # (images.py loads PIL only when an image's shape is read): those are the images extra.
    install_requires=[
        "torch>=2.4,<2.15",
        "torchserve==0.12.0",
        "torch-model-archiver==0.12.0",
        # torchserve 0.12.0 imports these without declaring them (the official image has
        # PyYAML 6.0.1 and captum 0.6.0)
        "pyyaml>=6",
        "captum>=0.6",
        # the core's sizes and budgets, the KServe v2 tensors
        "numpy>=1.24",
    ],
    extras_require={
        "images": IMAGES,
        "tools": TOOLS,
        "text": TEXT,
        # the suite covers every wing and example: it needs what they need
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",  # make test runs today's suite in processes
            # generative tests at the request and output boundaries
            "hypothesis>=6.100",
            # the floor's static check (tests/tools/test_floor.py)
            "vermin>=1.6",
            "packaging>=23",
            *IMAGES,
            *TOOLS,
            *TEXT,
            *BENCH,  # tests/tools draws the benchmarks' plots
        ],
        "bench": BENCH,
        "dev": ["ruff>=0.6", "mypy>=1.10"],
    },
    # The tools as commands after `pip install ts_microbatch[tools]`; each is also
    # `python -m ts_microbatch.tools.<module>` (what the Makefile runs in a checkout).
    entry_points={
        "console_scripts": [
            "ts-microbatch-benchmark = ts_microbatch.tools.benchmark:main",
            "ts-microbatch-tune = ts_microbatch.tools.tune:main",
            "ts-microbatch-serve = ts_microbatch.tools.serve:main",
            "ts-microbatch-scrape = ts_microbatch.tools.scrape:main",
            "ts-microbatch-bundle = ts_microbatch.tools.bundle:main",
        ]
    },
)
