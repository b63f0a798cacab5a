// What the tier store reports: the code path that serves each SSD path, never guessed.
#include "ssd_path.hpp"
#include "teraio/core/strings.hpp"
#include "teraio/core/units.hpp"
#include "teraio/io/tier_store.hpp"

namespace teraio::io {

TierStoreReport TierStore::report() const {
  TierStoreReport out;
  out.copier = copier_.name();
  out.copy_order = copier_.order();
  out.host_capacity = host_->capacity();
  out.host_used = host_->used();
  out.host_bytes_written = host_bytes_written_;
  out.host_bytes_read = host_bytes_read_;
  out.host_numa = host_->numa();
  out.watchers_poll = !copier_.completes_in_order();
  out.watcher_slack = watcher_slack_.describe();
  out.stripe_unit = config_.stripe_unit;
  out.chunk_bytes = config_.chunk_bytes;
  out.checksums = config_.checksums;
  for (std::size_t i = 0; i < paths_.size(); ++i) {
    const SsdPath& path = *paths_[i];
    PathReport r;
    r.path = path.file->path();
    r.backend = path.backend->name();
    r.direct_io = path.file->direct_io();
    r.buffered_reason = path.file->buffered_reason();
    r.buffers_registered = path.buffers_registered;
    r.cufile_active = path.cufile != nullptr && !config_.checksums;
    r.cufile_detail =
        path.cufile != nullptr && config_.checksums
            ? cat(path.cufile_detail, "; bypassed because checksums need the bytes in host memory")
            : path.cufile_detail;
    r.capacity = stripes_->capacity(i);
    r.used = stripes_->used(i);
    r.bytes_written = path.bytes_written;
    r.bytes_read = path.bytes_read;
    out.paths.push_back(std::move(r));
  }
  return out;
}

std::string format_report(const TierStoreReport& report) {
  std::string text = cat(
      "tier store (copier ", report.copier, report.copy_order.empty() ? "" : cat(" in ", report.copy_order),
      ", chunk ", format_bytes(report.chunk_bytes), ", stripe unit ", format_bytes(report.stripe_unit),
      ", checksums ", report.checksums ? "on" : "off",
      report.watchers_poll ? cat(", watchers poll with ", report.watcher_slack) : "", ")\n");
  text += cat("  host tier: ", format_bytes(report.host_used), " of ", format_bytes(report.host_capacity),
              " used, ", format_bytes(report.host_bytes_written), " written, ",
              format_bytes(report.host_bytes_read), " read",
              report.host_numa.empty() ? "" : cat("; ", report.host_numa), "\n");
  for (const PathReport& p : report.paths) {
    text += cat("  ssd path ", p.path, ": ", p.backend, ", ",
                p.direct_io ? "O_DIRECT" : cat("buffered (", p.buffered_reason, ")"),
                p.buffers_registered ? ", registered buffers" : "", ", cuFile ",
                p.cufile_active ? "active" : "inactive", " (", p.cufile_detail, "), ", format_bytes(p.used),
                " of ", format_bytes(p.capacity), " used, ", format_bytes(p.bytes_written), " written, ",
                format_bytes(p.bytes_read), " read\n");
  }
  return text;
}

}  // namespace teraio::io
