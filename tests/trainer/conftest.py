"""The small pretrain/SFT/DPO data set every trainer test runs on, built once per module."""

import pytest

from tests.train_helpers import tiny_training_data


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_hf_tokenizer_dir):
    return tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)
