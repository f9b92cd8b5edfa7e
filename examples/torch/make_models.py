#!/usr/bin/env python3
"""The Python side of the PyTorch examples: the models, written as TorchScript.

  make_models.py DIR
      writes DIR/heat_surrogate.pt, the surrogate that heat_surrogate (Fortran)
      trains online: a CNN on a tile of the field, as an nn.Sequential of
      blocks so that ZeRO-3 runs it block by block.
  make_models.py check TRAINED.pt PAIR.bin
      loads the surrogate that heat_surrogate exported after training
      (dsm_torch_export_torchscript) and recomputes, in PyTorch, its error on
      the test pair the program wrote (--pair): the same number the program
      printed, from the file Python reads.

Run it with a Python that has PyTorch (Debian: /usr/bin/python3 with
python3-torch). The C++ example (train_transformer.cc) defines its model in
C++ with the LibTorch frontend and needs no file from here.

The surrogate. The solver advances u by one step of an explicit
advection-diffusion scheme whose stencil is 3 x 3, so the increment
u(t+dt) - u(t) at a point depends on the 3 x 3 neighbourhood of u(t) there.
The CNN sees a tile of (T+2) x (T+2) values and predicts the increment on
the T x T interior: a 3 x 3 convolution without padding, then 1 x 1
convolutions. The program normalizes each tile (minus its mean, over its
standard deviation) and scales the increment the same way; the scheme is
linear and conserves constants, so the normalized pair is the same map.
"""
import struct
import sys

import torch

WIDTH = 16  # hidden channels
SEED = 0


def heat_surrogate():
    """[B, 1, T+2, T+2] -> [B, 1, T, T], any T >= 1."""
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Conv2d(1, WIDTH, 3), torch.nn.Tanh()),
        torch.nn.Sequential(torch.nn.Conv2d(WIDTH, WIDTH, 1), torch.nn.Tanh()),
        torch.nn.Conv2d(WIDTH, 1, 1),
    )


def write_models(d):
    import os
    os.makedirs(d, exist_ok=True)
    torch.jit.script(heat_surrogate()).save(os.path.join(d, "heat_surrogate.pt"))


def check(trained, pair):
    """PAIR.bin (written by heat_surrogate --pair): int32 nx, ny; float64 the
    mean and deviation the program normalized with; float32 the strip u(t)
    with its halo, [ny+2][nx+2] (C order: Fortran's u(0:nx+1, 0:ny+1)), and the
    solver's u(t+dt) on the interior, [ny][nx]. Prints the relative error of
    the surrogate's increment against the solver's."""
    with open(pair, "rb") as f:
        nx, ny = struct.unpack("<2i", f.read(8))
        mean, std = struct.unpack("<2d", f.read(16))
        u = torch.frombuffer(bytearray(f.read(4 * (nx + 2) * (ny + 2))), dtype=torch.float32).view(ny + 2, nx + 2)
        un = torch.frombuffer(bytearray(f.read(4 * nx * ny)), dtype=torch.float32).view(ny, nx)
    model = torch.jit.load(trained)
    with torch.no_grad():
        x = ((u.double() - mean) / std).float()
        du = model(x[None, None])[0, 0].double() * std
    truth = un.double() - u[1:-1, 1:-1].double()
    err = float((du - truth).norm() / truth.norm())
    print("PyTorch: the exported surrogate's one-step error on rank 0's strip %.6f" % err)
    return err


if __name__ == "__main__":
    if len(sys.argv) == 2:
        write_models(sys.argv[1])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
