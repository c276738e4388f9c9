"""The model zoo: real architectures from a model library, with random weights (no downloads), and
the plain PyTorch modules users write. `python -m bench --suite zoo [--scale small]` tunes and
times them like the `models` suite (bench/model_suite.py); `tests/model/test_zoo.py` builds the
small
ones and checks their outputs against PyTorch eager.

Each entry makes an `nn.Module` and its example inputs at a scale: `small` (one layer, hidden
sizes of 32-64: seconds to build, for CI) or `full` (one layer or stage at the real model's
sizes: BERT-base's 768 hidden and 128 tokens, Llama-7B-like proportions at a smaller width, a
224² image). Hugging Face `transformers` models are wrapped to return their first output (the
last hidden state), eager attention, no KV cache: what `torch.export` and TVM's frontend take.
Needs torch and transformers: `pip install -e '.[zoo]'`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Made = tuple[Any, tuple[Any, ...]]  # (the module in eval mode, its example inputs)


@dataclass(frozen=True)
class ZooModel:
    name: str
    kind: str  # "cnn", "encoder", "decoder", "vision-transformer", "plain"
    make: Callable[[str], Made]  # scale -> (module, inputs)


def _torch() -> tuple[Any, Any]:
    import torch
    import transformers

    return torch, transformers


def _first_output(torch: Any, model: Any) -> Any:
    class FirstOutput(torch.nn.Module):
        """The model's first output (its last hidden state), as one tensor."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            out = self.model(*args)
            return out[0] if isinstance(out, tuple) else out.last_hidden_state

    return FirstOutput().eval()


def _ids(torch: Any, seq: int, vocab: int) -> tuple[Any, ...]:
    return (torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(0)),)


def _image(torch: Any, size: int, channels: int = 3) -> tuple[Any, ...]:
    return (torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(0)),)


# text models: (hidden, heads, ffn, tokens, vocab) per scale
_TEXT = {"small": (32, 2, 64, 16, 100), "full": (768, 12, 3072, 128, 1000)}


def _text(name: str, config: Callable[..., Any], model: str, *, kv: bool = False,
          **extra: Any) -> Callable[[str], Made]:
    def make(scale: str) -> Made:
        torch, tf = _torch()
        hidden, heads, ffn, seq, vocab = _TEXT[scale]
        cfg = config(tf)(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=heads,
                         intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=512,
                         attn_implementation="eager",
                         **({"num_key_value_heads": max(1, heads // 4), "use_cache": False}
                            if kv else {}), **extra)
        torch.manual_seed(0)
        return _first_output(torch, getattr(tf, model)(cfg)), _ids(torch, seq, vocab)

    return make


def _gpt2(scale: str) -> Made:
    torch, tf = _torch()
    hidden, heads, ffn, seq, vocab = _TEXT[scale]
    cfg = tf.GPT2Config(n_embd=hidden, n_layer=1, n_head=heads, n_inner=ffn, vocab_size=vocab,
                        n_positions=512, attn_implementation="eager", use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return _first_output(torch, tf.GPT2Model(cfg)), _ids(torch, seq, vocab)


def _t5_encoder(scale: str) -> Made:
    torch, tf = _torch()
    hidden, heads, ffn, seq, vocab = _TEXT[scale]
    cfg = tf.T5Config(d_model=hidden, d_kv=hidden // heads, d_ff=ffn, num_layers=1,
                      num_heads=heads, vocab_size=vocab, attn_implementation="eager")
    torch.manual_seed(0)
    return _first_output(torch, tf.T5EncoderModel(cfg)), _ids(torch, seq, vocab)


def _whisper_encoder(scale: str) -> Made:
    torch, tf = _torch()
    hidden, heads, ffn, seq, vocab = _TEXT[scale]
    mels, frames = (16, 32) if scale == "small" else (80, 3000)
    cfg = tf.WhisperConfig(d_model=hidden, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=heads, decoder_attention_heads=heads,
                           encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, num_mel_bins=mels,
                           max_source_positions=frames // 2, vocab_size=vocab,
                           attn_implementation="eager", pad_token_id=0, bos_token_id=0,
                           eos_token_id=0, decoder_start_token_id=0)
    torch.manual_seed(0)
    encoder = tf.WhisperModel(cfg).get_encoder()
    x = torch.randn(1, mels, frames, generator=torch.Generator().manual_seed(0))
    return _first_output(torch, encoder), (x,)


def _vit(scale: str) -> Made:
    torch, tf = _torch()
    hidden, heads, ffn, _, _ = _TEXT[scale]
    size, patch = (32, 8) if scale == "small" else (224, 16)
    cfg = tf.ViTConfig(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=heads,
                       intermediate_size=ffn, image_size=size, patch_size=patch,
                       attn_implementation="eager")
    torch.manual_seed(0)
    return _first_output(torch, tf.ViTModel(cfg)), _image(torch, size)


def _swin(scale: str) -> Made:
    torch, tf = _torch()
    size, dim, heads = (32, 16, [1, 2]) if scale == "small" else (224, 96, [3, 6])
    cfg = tf.SwinConfig(image_size=size, patch_size=4, embed_dim=dim, depths=[1, 1],
                        num_heads=heads, window_size=4 if scale == "small" else 7)
    torch.manual_seed(0)
    return _first_output(torch, tf.SwinModel(cfg)), _image(torch, size)


def _convnext(scale: str) -> Made:
    torch, tf = _torch()
    size, widths = (32, [16, 32]) if scale == "small" else (224, [96, 192])
    cfg = tf.ConvNextConfig(hidden_sizes=widths, depths=[1, 1], num_stages=2, image_size=size)
    torch.manual_seed(0)
    return _first_output(torch, tf.ConvNextModel(cfg)), _image(torch, size)


def _resnet(scale: str) -> Made:
    torch, tf = _torch()
    size, widths = (32, [16, 32]) if scale == "small" else (224, [64, 128])
    cfg = tf.ResNetConfig(embedding_size=widths[0], hidden_sizes=widths, depths=[1, 1],
                          layer_type="basic")
    torch.manual_seed(0)
    return _calibrated(torch, _first_output(torch, tf.ResNetModel(cfg)), _image(torch, size))


def _mobilenet_v2(scale: str) -> Made:
    torch, tf = _torch()
    size, mult = (32, 0.35) if scale == "small" else (224, 1.0)
    cfg = tf.MobileNetV2Config(image_size=size, depth_multiplier=mult)
    torch.manual_seed(0)
    return _calibrated(torch, _first_output(torch, tf.MobileNetV2Model(cfg)), _image(torch, size))


def _encoder_layer(scale: str) -> Made:
    """PyTorch's own `nn.TransformerEncoderLayer` (BERT-base sizes at full scale)."""
    torch, _ = _torch()
    hidden, heads, ffn, seq, _ = _TEXT[scale]
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(hidden, heads, ffn, activation="gelu",
                                             batch_first=True).eval()
    x = torch.randn(1, seq, hidden, generator=torch.Generator().manual_seed(0))
    return layer, (x,)


def _custom_cnn(scale: str) -> Made:
    """A CNN as users write one: their own module classes, batch norm, a residual block."""
    torch, _ = _torch()
    nn = torch.nn
    size, width = (16, 8) if scale == "small" else (112, 64)

    class Residual(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, input: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(input)))
            return torch.relu(input + self.bn2(self.conv2(y)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU())
            self.block = Residual(width)
            self.pool = nn.MaxPool2d(2)
            self.head = nn.Linear(width, 10)

        def forward(self, input: Any) -> Any:
            return self.head(self.pool(self.block(self.stem(input))).mean((2, 3)))

    torch.manual_seed(0)
    return _calibrated(torch, Net(), _image(torch, size))


def _calibrated(torch: Any, net: Any, inputs: tuple[Any, ...]) -> Made:
    """Batch norm's running statistics from the example input (fresh ones, mean 0 and variance
    1, shrink a deep net's activations until the output check compares nothing)."""
    norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    if norms:  # a batch of 8 like the input: a 1×1 feature map needs more than one value
        gen = torch.Generator().manual_seed(1)
        batch = tuple(torch.randn((8, *x.shape[1:]), generator=gen) for x in inputs)
        net.train()
        with torch.no_grad():
            net(*batch)
    return net.eval(), inputs


ZOO: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("bert", "encoder", _text("bert", lambda tf: tf.BertConfig, "BertModel")),
    ZooModel("gpt2", "decoder", _gpt2),
    ZooModel("llama", "decoder", _text("llama", lambda tf: tf.LlamaConfig, "LlamaModel",
                                       kv=True)),
    ZooModel("qwen2", "decoder", _text("qwen2", lambda tf: tf.Qwen2Config, "Qwen2Model",
                                       kv=True)),
    ZooModel("mistral", "decoder", _text("mistral", lambda tf: tf.MistralConfig,
                                         "MistralModel", kv=True, sliding_window=None)),
    ZooModel("t5-encoder", "encoder", _t5_encoder),
    ZooModel("whisper-encoder", "encoder", _whisper_encoder),
    ZooModel("vit", "vision-transformer", _vit),
    ZooModel("swin", "vision-transformer", _swin),
    ZooModel("convnext", "cnn", _convnext),
    ZooModel("resnet", "cnn", _resnet),
    ZooModel("mobilenetv2", "cnn", _mobilenet_v2),
    ZooModel("encoder-layer", "plain", _encoder_layer),
    ZooModel("custom-cnn", "plain", _custom_cnn),
]}
