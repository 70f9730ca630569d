import torch

torch.set_num_threads(1)  # the test machine is small and shared
