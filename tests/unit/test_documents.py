"""Packed documents in one process (lightning_dist/models/documents.py, `data.pack_documents`):
document ids and positions from the separators, the mask, the model keeping each document to
itself, and the windows the datasets hand out. (Every parallel layout against one device:
tests/dist/test_context_parallel_train_dist.py.)"""

import numpy as np
import torch

from lightning_dist.lm.datasets import SyntheticTokens, TokenWindows
from lightning_dist.models.args import ModelArgs
from lightning_dist.models.documents import (
    document_causal_mask,
    document_ids,
    document_positions,
)

SEP = 9


def test_a_separator_ends_its_document_and_positions_restart_after_it():
    tokens = torch.tensor([[5, 1, SEP, 3, SEP, SEP, 2, 4], [1, 2, 3, 4, 5, 6, 7, SEP]])
    documents = document_ids(tokens, SEP)
    assert documents.tolist() == [[0, 0, 0, 1, 1, 2, 3, 3], [0] * 8]
    assert document_positions(documents).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]


def test_the_mask_is_causal_inside_each_document_and_closed_between_them():
    documents = torch.tensor([[0, 0, 1, 1]])
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    mask = document_causal_mask(documents, documents, causal)
    assert mask.shape == (1, 1, 4, 4)
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]


def _model():
    args = ModelArgs(
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=16,
        ffn_hidden_size=64,
        max_seq_len=32,
    )
    torch.manual_seed(0)
    return args.build().double()


def _logits(model, tokens: torch.Tensor, packed: bool = True) -> torch.Tensor:
    if not packed:
        return model(tokens)
    documents = document_ids(tokens, SEP)
    return model(tokens, document_positions(documents), documents)


def test_a_document_sees_nothing_of_the_one_before_it():
    """Document 2's logits do not change when document 1's tokens do, and equal those of
    document 2 alone at the start of a sequence (positions restart); without the document
    mask they change (so the first check can fail)."""
    model = _model()
    first, second = [1, 2, 3, 4, 5, SEP], [6, 7, 8, 2, 1]
    changed_first = [3, 3, 1, 8, 0, SEP]
    tokens = torch.tensor([first + second, changed_first + second])
    with torch.no_grad():
        packed = _logits(model, tokens)[:, len(first) :]
        alone = _logits(model, torch.tensor([second]))
        unmasked = _logits(model, tokens, packed=False)[:, len(first) :]
    torch.testing.assert_close(packed[0], packed[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(packed[0], alone[0], rtol=0, atol=1e-12)
    assert (unmasked[0] - unmasked[1]).abs().max() > 1e-3


def test_windows_of_packed_text_carry_the_document_of_each_token():
    tokens = np.array([5, 1, SEP, 3, SEP, 2, 4, 6, 7], dtype=np.uint16)
    windows = TokenWindows(tokens, 4, separator=SEP)
    assert windows[0]["tokens"].tolist() == [5, 1, SEP, 3, SEP]
    assert windows[0]["documents"].tolist() == [0, 0, 0, 1, 1]
    assert windows[1]["documents"].tolist() == [0, 1, 1, 1, 1]  # ids count from each window
    assert torch.is_tensor(TokenWindows(tokens, 4)[0])  # unpacked: the ids alone


def test_synthetic_documents_are_deterministic_and_end_with_the_last_id():
    data = SyntheticTokens(8, 128, 64, seed=3, documents=True)
    windows = [data[i] for i in range(8)]
    assert all(torch.equal(w["tokens"], data[i]["tokens"]) for i, w in enumerate(windows))
    for window in windows:
        tokens, documents = window["tokens"], window["documents"]
        assert tokens.max() == 63 and documents.max() >= 2  # several documents per window
        assert torch.equal(documents, document_ids(tokens, 63))
        lengths = torch.bincount(documents)[:-1]  # the last one is cut by the window's end
        assert 1 <= int(lengths.min()) and int(lengths.max()) <= 128 // 2 + 1
