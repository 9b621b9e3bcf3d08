# SPDX-License-Identifier: Apache-2.0
# Install layout and the Debian package (cpack -G DEB). See packaging/README.md.
include(GNUInstallDirs)

if(BATCHLENS_BUILD_GUI)
  install(FILES "${PROJECT_SOURCE_DIR}/packaging/io.github.batchlens.BatchLens.desktop"
          DESTINATION "${CMAKE_INSTALL_DATADIR}/applications")
  install(FILES "${PROJECT_SOURCE_DIR}/packaging/io.github.batchlens.BatchLens.metainfo.xml"
          DESTINATION "${CMAKE_INSTALL_DATADIR}/metainfo")
  install(FILES "${PROJECT_SOURCE_DIR}/resources/icons/batchlens.svg"
          DESTINATION "${CMAKE_INSTALL_DATADIR}/icons/hicolor/scalable/apps"
          RENAME io.github.batchlens.BatchLens.svg)
  install(FILES "${PROJECT_SOURCE_DIR}/resources/icons/batchlens-256.png"
          DESTINATION "${CMAKE_INSTALL_DATADIR}/icons/hicolor/256x256/apps"
          RENAME io.github.batchlens.BatchLens.png)
endif()

set(CPACK_PACKAGE_NAME "batchlens")
set(CPACK_PACKAGE_VENDOR "BatchLens developers")
set(CPACK_PACKAGE_CONTACT "BatchLens developers <batchlens@users.noreply.github.com>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_INSTALL_DIRECTORY "batchlens")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR "DEB")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "science")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${PROJECT_HOMEPAGE_URL}")
# CPack puts CPACK_PACKAGE_DESCRIPTION_SUMMARY first and formats this as the extended text.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "BatchLens runs or loads paired batch-size experiments of the DiffusionGemma block-diffusion \
language model and shows where, when and in which op the generated text of a batched run \
departs from the batch-size-1 reference, with a headless CLI for GPU servers.")
# dpkg-shlibdeps derives the library dependencies (libtorch1.13, libhdf5-cpp, libqt6widgets6,
# libqcustomplot2.1-qt6, ...) from the binaries themselves, so they cannot drift.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
include(CPack)
