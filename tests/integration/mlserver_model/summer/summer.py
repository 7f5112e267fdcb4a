import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse


class SumModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        if not np.isfinite(x).all():
            raise MLServerError("input x holds NaN or Inf", status_code=400)
        y = x.reshape(x.shape[0], -1).sum(axis=1, keepdims=True).astype(np.float32)
        return InferenceResponse(model_name=self.name, id=payload.id,
                                 outputs=[NumpyCodec.encode_output("sum", y)])
