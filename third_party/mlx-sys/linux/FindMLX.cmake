# Ondo patch: find a prebuilt MLX (the official `mlx` wheel, or any folder with
# include/mlx and lib/libmlx.so) without the wheel's own MLXConfig.cmake, which
# in the CUDA wheel demands a CUDA toolkit just to be found.
find_path(MLX_INCLUDE_DIR mlx/mlx.h HINTS "${MLX_PREFIX}/include" NO_DEFAULT_PATH)
find_library(MLX_LIBRARY NAMES mlx HINTS "${MLX_PREFIX}/lib" NO_DEFAULT_PATH)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(MLX REQUIRED_VARS MLX_LIBRARY MLX_INCLUDE_DIR)

if(MLX_FOUND AND NOT TARGET mlx)
  add_library(mlx SHARED IMPORTED)
  set_target_properties(mlx PROPERTIES
    IMPORTED_LOCATION "${MLX_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${MLX_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_20)
endif()
