"""A model file as users write one for `tunefarm tune-model` / `tunefarm build`: GPT-2 (one block,
small widths) from transformers' config with random weights, no download. Needs the zoo extra:
`pip install -e '.[zoo]'`. docs/models.md tunes, builds and checks it."""

import torch
import transformers


class LastHiddenState(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        config = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=1000,
                                         n_positions=128, attn_implementation="eager",
                                         use_cache=False, bos_token_id=0, eos_token_id=0)
        self.gpt2 = transformers.GPT2Model(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.gpt2(input_ids).last_hidden_state


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return LastHiddenState().eval()


def example_inputs() -> tuple[torch.Tensor]:
    return (torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(0)),)
