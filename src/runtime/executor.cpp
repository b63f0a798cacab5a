#include "teraio/runtime/executor.hpp"
