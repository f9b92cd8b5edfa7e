// HDF5 identifiers owned by RAII, and silencing HDF5's error printing: shared
// by the library's checkpoint code and the dsm-ckpt tool.
#pragma once

#include <hdf5.h>

namespace dsm {
namespace ckpt {

// Owns an HDF5 identifier and closes it with the matching H5?close.
class Handle {
public:
    using Closer = herr_t (*)(hid_t);
    Handle() = default;
    Handle(hid_t id, Closer close) noexcept : id_(id), close_(close) {}
    Handle(const Handle &) = delete;
    Handle &operator=(const Handle &) = delete;
    Handle(Handle &&o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
    Handle &operator=(Handle &&o) noexcept {
        if (this != &o) {
            reset();
            id_ = o.id_;
            close_ = o.close_;
            o.id_ = H5I_INVALID_HID;
        }
        return *this;
    }
    ~Handle() { reset(); }
    hid_t get() const noexcept { return id_; }
    bool valid() const noexcept { return id_ >= 0; }
    // Gives up ownership, for a close whose failure must be reported.
    hid_t release() noexcept {
        const hid_t id = id_;
        id_ = H5I_INVALID_HID;
        return id;
    }
    void reset() noexcept {
        if (id_ >= 0 && close_ != nullptr) close_(id_);
        id_ = H5I_INVALID_HID;
    }

private:
    hid_t id_ = H5I_INVALID_HID;
    Closer close_ = nullptr;
};

// While one of these lives, HDF5 prints nothing on failures (the caller's
// handler comes back after); errors are read from the stack instead.
class QuietHdf5 {
public:
    QuietHdf5() noexcept {
        H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
        H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    }
    ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
    QuietHdf5(const QuietHdf5 &) = delete;
    QuietHdf5 &operator=(const QuietHdf5 &) = delete;

private:
    H5E_auto2_t func_ = nullptr;
    void *data_ = nullptr;
};

} // namespace ckpt
} // namespace dsm
