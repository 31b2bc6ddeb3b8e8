"""Sends images through the KServe Python SDK's REST client, v1 and v2, and prints the
answers as JSON. Run with the SDK's interpreter (.venv-kserve):

    .venv-kserve/bin/python deploy/kserve/client_check.py \
        http://127.0.0.1:8085 resnet-18_mb a.jpg b.jpg
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(url: str, model: str, images: list[Path]) -> None:
    data = [base64.b64encode(p.read_bytes()).decode() for p in images]
    v1 = InferenceRESTClient(RESTConfig(protocol="v1"))
    v1_answer = await v1.infer(url, {"instances": [{"data": d} for d in data]}, model_name=model)
    v2 = InferenceRESTClient(RESTConfig(protocol="v2"))
    tensor = InferInput(name="image", shape=[len(data)], datatype="BYTES", data=data)
    request = InferRequest(model_name=model, infer_inputs=[tensor], request_id="sdk-client")
    v2_answer = await v2.infer(url, request, model_name=model)
    print(
        json.dumps(
            {
                "v1": v1_answer,
                "v2": {
                    "id": v2_answer.id,
                    "model_name": v2_answer.model_name,
                    "outputs": [o.data for o in v2_answer.outputs],
                },
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], [Path(p) for p in sys.argv[3:]]))
