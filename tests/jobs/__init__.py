"""Small training jobs the subprocess tests run through `schedtrain train`."""
